"""Settings: declared options (:mod:`.options`), the library's options and the frozen
:class:`~.config.Settings` read from ``JODL_*`` variables (:mod:`.config`), and the entry
points through which installed packages add families, commands, options, services and
migrations (:mod:`.plugins`)."""
