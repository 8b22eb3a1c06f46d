"""Rendering: the HTML report for people, JSON for machines, a summary for the terminal."""
