"""The reference models (sir, boids, schelling, wolfsheep, randomwalk, flu, spillover, circles, sugarscape, covid).

They live in the top-level ``models/`` folder of the repository and install as
``agentsim.models`` (see ``[tool.setuptools.package-dir]`` in ``pyproject.toml``), so
nothing named ``models`` lands in a user's site-packages. Load them by name with
:func:`agentsim.get_model` or import them: ``from agentsim.models.sir import MODEL``.
"""
