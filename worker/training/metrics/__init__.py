"""Metrics shipped with gluejobs as local `evaluate` modules, so that no job needs the Hub."""
