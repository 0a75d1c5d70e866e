"""The HTTP replica: FastAPI app, OpenAI and admin routes, auth, quotas, the SLO door check."""
