"""The read side: one read model of an experiment (``read_model``), the view model every UI
renders (``view``), the incremental monitor behind the live widget (``monitor``) and the terminal
table (``terminal``). Readers never write to an experiment."""
