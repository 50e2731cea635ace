"""hvdtrain's subcommands, one module each, listed in cli.COMMANDS. A module declares NAME (the
subcommand), HELP (its line in 'hvdtrain --help'), add_arguments(parser) (its options and
description, added when it is the subcommand used) and run(args) -> exit status."""
