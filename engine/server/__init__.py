"""The OpenAI-compatible HTTP server in front of an engine.

NOTE: nothing here imports FastAPI or uvicorn at package import, so ``servescope --help`` and the
other commands stay fast; ``engine.server.app`` pulls them in.
"""
