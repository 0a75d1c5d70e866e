from gateway.cli.process_exit import prepare_exit
from gateway.worker.main import main

main()
prepare_exit()
