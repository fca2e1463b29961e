"""The speculation schedule: K per concurrency range from a run's report (:mod:`.derive`) and the
forms each engine loads it in (:mod:`.forms`); the file itself is
:class:`pipeline.artefacts.schedule.SpeculationSchedule`. docs/schedule.md."""
