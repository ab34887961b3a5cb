"""bakery: build serverless-ready images for OpenAI-compatible inference engines."""

__version__ = "0.1.0"
