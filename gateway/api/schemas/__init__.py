"""Pydantic request/response schemas: the admin families (admin.py, quotas.py) and the OpenAI
request bodies (openai.py)."""
