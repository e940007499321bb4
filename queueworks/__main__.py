from queueworks.cli.main import main

main(prog_name="queueworks")
