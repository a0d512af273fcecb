"""qcli: command-line front end over whichever q* method packages are installed."""

__version__ = "0.1.0"
