import gc

from gateway.worker.main import main

main()
gc.freeze()  # the interpreter's shutdown collections then walk none of the engine's objects
