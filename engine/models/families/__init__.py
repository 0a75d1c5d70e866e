"""One module per model family: its `MODEL_TYPES` and `spec(config)`, how its transformers config
maps onto the one decoder loop (engine/models/spec.py). Torch-free."""
