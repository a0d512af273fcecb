"""One module per subcommand. Each defines ``add_parser(subparsers)``; ``qcli.main`` finds them all."""
