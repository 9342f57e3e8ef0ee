"""``python -m models``: the parameter count of every preset, built on the meta device."""

from models.presets import main

main()
