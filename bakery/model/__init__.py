"""A model baked into an engine image (`build.py --model`): where it is read from and what it must be
(source), the manifest of its files' sha256 (manifest), and how it reaches the build context (stage)."""
