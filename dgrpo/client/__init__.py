"""dgrpo's own client logic behind ART's façade: the models (``model``: ``Model``; ``trainable_model``:
``TrainableModel``; ``openai_client``: the model's wrapped OpenAI client), the backends (``backends``: the
``Backend`` protocol and the cluster connection; ``training``: ART's ``backend.train`` and the seam a model
asks; ``temporal_backend``: ``TemporalBackend``), the durable calls they make (``train_step``: a
``TrainStep``; ``sft``: a ``TrainSFT``; ``attach``: joining a workflow another client started) and
``run_control`` (start, steer and watch ``TrainingRun`` workflows). ART's paths (``dgrpo.model``,
``dgrpo.backend``, ``dgrpo.local``) re-export from here."""
