"""A trainer over several devices and hosts: one trainer worker drives N rank processes on torch.distributed.

The worker (``dgrpo worker trainer --ranks N``, ``--gang NAME`` over hosts) keeps the activities it always had;
what trains is a gang of rank processes, each on one device: FSDP2 shards the frozen base and the adapter
(``--shard fsdp``) or every rank holds the whole model (``--shard replicate``), each trains its share of a step's
sequences, and the gradients are summed so the update is the one a single device makes. Rank 0 writes the step's
checkpoint gathered to the format one device writes, so serving, resume and the client never see the ranks.

- ``split.py``: a step's sequences split over the ranks;
- ``collectives.py``: the ranks as a step's loop sees them (activities/ranks.py), over torch.distributed;
- ``sharded.py``: ``ShardedTrainer``, a trainer whose model is one rank's part, its state loaded and gathered;
- ``initial.py``: a run's step-0 adapter without loading the base's weights;
- ``messages.py``: what a worker and its rank processes say to each other;
- ``rank.py``: the rank process (``python -m activities.gang.rank``);
- ``local_ranks.py``: a worker's rank processes, started and watched (host/processes.py's lifecycle);
- ``rendezvous.py``: the gang's members and each step's roster, through the object store;
- ``coordinator.py``: one attempt's gang formed, as its leader or as a member it invited;
- ``shared_step.py``: the step a leader shares with the members (JSON and safetensors, no pickle);
- ``activities.py``: ``GangTrainerActivities``, the trainer queue's activities over a gang.
"""
