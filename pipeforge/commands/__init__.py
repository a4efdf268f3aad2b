"""One module per subcommand of ``pipeforge``; shared argument helpers in ``common``."""
