"""GET /v1/models and /v1/models/{id}: the names this server answers to, loaded now or not."""

from __future__ import annotations

from fastapi import APIRouter

from localspec.server.backend import Catalog
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.schemas import ModelCard, ModelList
from localspec.server.state import ServerState, State, check_model

router = APIRouter()


def catalog(state: ServerState) -> Catalog:
    """The served names: the loaded models', or, while unloaded (keep-alive, stop), the last load's."""
    if state.loader.backend is None and state.loader.catalog is not None:
        return state.loader.catalog
    return Catalog.of(state.backend())  # a 503 while the first load runs


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(state: State) -> ModelList:
    c = catalog(state)
    loaded = state.loader.backend is not None
    # The adapter is named on the cards its answers come from: the target's, not another tier's.
    cards = [ModelCard(id=n, localspec={"model": model, "role": "chat", "route": route, "target": c.target_id,
                                        "profile": c.profile, "loaded": loaded,
                                        "adapter": c.adapter if model == c.target_id else None})
             for n, (model, route) in sorted(c.names.items())]
    cards += [ModelCard(id=n, localspec={"model": c.embedding_id, "role": "embedding", "loaded": loaded})
              for n in sorted(c.embedding_names)]
    return ModelList(data=cards)


@router.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def get_model(model_id: str, state: State) -> ModelCard:
    c = catalog(state)
    check_model(model_id, set(c.names) | set(c.embedding_names))
    return ModelCard(id=model_id)
