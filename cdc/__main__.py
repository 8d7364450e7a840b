from cdc.cli.cli import main

main()
