"""HTTP routers: health, OpenAI-compatible inference and models, admin tenants/keys/usage."""
