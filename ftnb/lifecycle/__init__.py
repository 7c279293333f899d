"""Starting, owning and resuming an experiment, one module per step, in the order they happen:

``plan_new``         a new experiment checked before its folder is touched, its first state
``stored``           finding a stored experiment (its state, or what is there instead)
``plan_restore``     a restore checked against the stored experiment, writing nothing
``rebinding``        the stored objects of a restored space paired with those given again
``own``              the lease taken: the previous driver fenced out, what it left ended
``reconcile``        the trials' records brought up to date with their files
``run``              the controller built and run (``run_new``, ``run_restored``)
``trial_names``      ``TuneConfig``'s trial name creators applied
``start_or_resume``  by name: start it, or resume it when it is stored

The front doors (``ftnb.Tuner``, ``ftnb.TorchTrainer``, ``ftnb.run``) import this package,
never the reverse: what the lifecycle needs of them it is given, as an argument that keeps a
protocol (:class:`~ftnb.lifecycle.plan_new.NewExperiment`, :class:`~ftnb.lifecycle.run.
RunnableExperiment`, :class:`~ftnb.lifecycle.start_or_resume.FrontDoor`). Nothing is imported
here: each module is imported where it is used.
"""
