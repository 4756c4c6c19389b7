"""The ``freescale`` CLI's commands, one module per command: its parser (``add_<command>``) and its run
(``cmd_<command>``). ``freescale.tools.cli`` builds the parser from them and dispatches."""
