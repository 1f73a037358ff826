"""``dgrpo art-server``: ART's backend HTTP protocol (``art run``) in front of dgrpo's durable backend, so a client
of ART's server (NVIDIA NeMo Agent Toolkit's ``RemoteBackend``) trains on dgrpo.

Two listeners in one process: ART's API (``art_api.py``: ``/healthcheck``, ``/register``, ``/_get_step``,
``/_prepare_backend_for_training``, ``/_train_model``, ...) and an OpenAI-compatible endpoint
(``openai_api.py``) that serves each registered model's newest step under the model's own name, as ART's vLLM
does, in front of the backend's inference server. ``models.py`` holds the models the clients registered;
``training.py`` makes each ``/_train_model`` one durable ``TrainStep`` that a repeated request joins instead of
training again; ``options.py`` is the command's settings; ``server.py`` runs it all. docs/art-server.md.
"""
