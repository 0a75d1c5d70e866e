"""The engine worker process: lanes in, engine steps, tokens out."""
