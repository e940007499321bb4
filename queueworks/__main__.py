from queueworks.cli import main

main()
