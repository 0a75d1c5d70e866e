"""Tenants' LoRA adapters on the server side: the content-addressed file store, upload validation
against the served model (torch-free), and the selection of an adapter by model name."""
