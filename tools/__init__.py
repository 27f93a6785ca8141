"""Developer and operator tools built on afterword (not part of the installed package)."""
