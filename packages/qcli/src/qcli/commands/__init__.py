"""One module per subcommand, each with ``add_arguments(parser)`` filling that subcommand's parser.

``qcli.main`` imports a command's module only when the command is used: the modules import
qcore, and with it Paddle (over a second), which ``qcli --help`` does without.
"""

#: Subcommand (its module's name) -> the line ``qcli --help`` shows for it.
COMMANDS = {
    "bench": "latency and agreement, float vs int8, on each deployment backend",
    "demo": "quantize the bundled demo model and compare it with the float one",
    "embed": "quantize embedding tables (a saved Paddle model dir, or a .npy table) to int8/int4",
    "export": "write a model (float or quantized) in an exchange format",
    "ptq": "post-training quantization (needs qptq)",
    "qat": "quantization-aware fine-tuning of the bundled demo model, float vs int8 table",
}
