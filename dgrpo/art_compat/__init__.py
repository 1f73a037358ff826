"""How ART's API maps onto dgrpo's: ``options`` (ART's configuration dicts translated, or refused saying why)
and ``refusals`` (the ART names and module paths dgrpo refuses, with the reasons; the finder that refuses
the module paths). Light: ``import dgrpo`` loads ``refusals``."""
