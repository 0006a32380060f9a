"""The endpoint's routes, one module per resource; `create_app` includes them all."""

from localspec.server.routes import (cache, chat, completions, embeddings, health, llamacpp, messages, models,
                                    ollama, ps, responses)

ROUTERS = (health.router, models.router, chat.router, responses.router, completions.router, embeddings.router,
           cache.router, ps.router, ollama.router, llamacpp.router, messages.router)
