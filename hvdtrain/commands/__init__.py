"""hvdtrain's subcommands, one module each: NAME, HELP, add_arguments(parser), run(args)."""
