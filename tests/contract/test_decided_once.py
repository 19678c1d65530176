"""What the sync worker's poller decided from a request's head (fronts/early.py, asked under a crowd) reaches the
Flask front's exchange in the WSGI environ, which takes it as made: a request is admitted once
(service/admission.py `Admitted`). Under uvicorn (async, hybrid) the app alone decides.

The `Admitted` names the model loaded here while the path names one that does not exist: the request goes on to that
model's codec (422 for a body without instances: no model runs here), so the route was not looked up again.
Without it, the path's model is looked up: 404.
"""

from __future__ import annotations

import orjson

from tests.unit.service.echo import echo_service
from twinserve.fronts.wsgi import create_wsgi_app
from twinserve.service.admission import Admitted
from twinserve.service.lifecycle import DECIDED

MODEL = "decided-echo"
PATH = "/v1/models/not-looked-up:predict"
BODY = orjson.dumps({"inputs_are_not_instances": ["a"]})


def test_the_sync_front_hands_the_pollers_decision_to_its_exchange() -> None:
    with echo_service(MODEL, arch="sync") as service:
        client = create_wsgi_app(service).test_client()
        decided = Admitted(2, service.runtimes[MODEL])
        answer = client.post(PATH, data=BODY, content_type="application/json", environ_overrides={DECIDED: decided})
        assert answer.status_code == 422 and "instances" in orjson.loads(answer.data)["error"]
        answer = client.post(PATH, data=BODY, content_type="application/json")
        assert answer.status_code == 404 and "not-looked-up" in orjson.loads(answer.data)["error"]
