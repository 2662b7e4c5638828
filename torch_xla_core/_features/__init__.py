"""The features layer (ARCHITECTURE.md, "Layers of the package"): implementation modules,
imported by their full names; this file imports nothing."""
