"""Probes: recorders that attach to a run and write one run directory.

``probes.session.ProbeSession`` runs them; ``probes.loader.load_run`` reads a run directory back.
Import the submodules directly: this package imports nothing itself, so a reader of run
directories (``probes.loader``) does not pull in the engine and torch.
"""
