"""Alembic environment and versions for fairlane's database (run through tenancy.db.upgrade)."""
