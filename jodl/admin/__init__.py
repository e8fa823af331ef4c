"""Administration through the database, shared by the commands and the web: families
configured without code (:mod:`.families`), their cron schedules (:mod:`.schedule`),
budgets (:mod:`.budget`) and cycles asked of the running master (:mod:`.requests`)."""
