from queueworks.cli import main

main(prog_name="queueworks")
