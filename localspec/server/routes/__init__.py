"""The endpoint's routes, one module per resource; `create_app` includes them all."""

from localspec.server.routes import (cache, chat, completions, embeddings, health, llamacpp, messages, models,
                                    ollama, ollama_store, ps, responses)

# ollama_store's before ollama's: the latter ends with the catch-all for Ollama's routes not served.
ROUTERS = (health.router, models.router, chat.router, responses.router, completions.router, embeddings.router,
           cache.router, ps.router, ollama_store.router, ollama.router, llamacpp.router, messages.router)
