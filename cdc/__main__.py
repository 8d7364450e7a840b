from cdc.cli.app import main

main()
