"""Trajectory capture: ``chat_completions`` records the chat completions a rollout makes into its
``Trajectory`` (ART's ``capture_auto_trajectory``, ``yield_trajectory``); ``chat_stream`` puts a streamed
completion back together. ART's paths ``dgrpo.auto_trajectory`` and ``dgrpo.yield_trajectory`` re-export them."""
