"""Plain FastAPI with a `def` endpoint (run in FastAPI's thread pool). Run: uvicorn ...fastapi_app:app"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Response
from pydantic import BaseModel

from .model import load_predictor

app = FastAPI()
predict = load_predictor()


class Body(BaseModel):
    instances: list[Any]


@app.post("/predict")
def serve(body: Body) -> Response:
    return Response(predict(body.instances), media_type="application/json")


@app.get("/health")
def health() -> str:
    return "ok"
