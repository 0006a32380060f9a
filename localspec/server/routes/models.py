"""GET /v1/models and /v1/models/{id}: the names this server answers to."""

from __future__ import annotations

from fastapi import APIRouter

from localspec.router import TierName
from localspec.server.errors import ERROR_RESPONSES
from localspec.server.schemas import ModelCard, ModelList
from localspec.server.state import State, check_model

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(state: State) -> ModelList:
    b = state.backend()
    cards = [ModelCard(id=n, localspec={"model": b.model_behind(n), "role": "chat",
                                        "route": b.route_for(n) or str(TierName.LARGE),
                                        "target": b.target_id, "profile": b.profile})
             for n in sorted(b.target_names)]
    cards += [ModelCard(id=n, localspec={"model": b.embedding_id, "role": "embedding"})
              for n in sorted(b.embedding_names)]
    return ModelList(data=cards)


@router.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def get_model(model_id: str, state: State) -> ModelCard:
    b = state.backend()
    check_model(model_id, b.target_names | b.embedding_names)
    return ModelCard(id=model_id)
