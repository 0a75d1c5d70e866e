from gateway.worker.main import main

main()
