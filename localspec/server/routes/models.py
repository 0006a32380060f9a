"""GET /v1/models and /v1/models/{id}: the names this server answers to, loaded now or not: the
profile's, the models loaded on demand, and every installed chat model a request may load."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from localspec.server.backend import Catalog
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.schemas import ModelCard, ModelInfo, ModelList
from localspec.server.state import ServerState, State, check_model

router = APIRouter()


def catalog(state: ServerState) -> Catalog:
    """The served names: the loaded models', or, while unloaded (keep-alive, stop), the last load's."""
    if state.loader.backend is None and state.loader.catalog is not None:
        return state.loader.catalog
    return Catalog.of(state.backend())  # a 503 while the first load runs


async def cards(state: ServerState) -> list[ModelCard]:
    c = catalog(state)
    loaded = state.loader.backend is not None
    # The adapter is named on the cards its answers come from: the target's, not another tier's.
    out = [ModelCard(id=n, localspec=ModelInfo(model=model, route=route, target=c.target_id, profile=c.profile,
                                               loaded=loaded, adapter=c.adapter if model == c.target_id else None))
           for n, (model, route) in sorted(c.names.items())]
    out += [ModelCard(id=n, localspec=ModelInfo(model=c.embedding_id, role="embedding", loaded=loaded))
            for n in sorted(c.embedding_names)]
    listed = {card.id for card in out}
    on_demand: dict[str, ModelInfo] = {}
    for m in await asyncio.to_thread(state.models.installed):
        on_demand[m.id] = ModelInfo(model=m.id, loaded=False, on_demand=True)
    for r in state.extra.values():  # a model a request loaded stays listed, even if no longer installed
        on_demand[r.key] = ModelInfo(model=r.key, loaded=r.loader.backend is not None, on_demand=True)
    out += [ModelCard(id=mid, localspec=info) for mid, info in sorted(on_demand.items()) if mid not in listed]
    return out


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(state: State) -> ModelList:
    return ModelList(data=await cards(state))


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def get_model(model_id: str, state: State) -> ModelCard:
    """One model's card, as the list has it. `:path`: a Hub name (hf.co/USER/REPO:QUANT) holds slashes,
    and was a bare route 404."""
    listed = next((card for card in await cards(state) if card.id == model_id), None)
    if listed is not None:
        return listed
    c = catalog(state)
    names = set(c.names) | set(c.embedding_names) | state.served_names()
    if model_id not in names and await asyncio.to_thread(state.models.find, model_id) is None:
        check_model(model_id, names)
    return ModelCard(id=model_id)
