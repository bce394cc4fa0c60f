"""Diagrams drawn by code from the library's own objects (a real block table, a real split plan, the
real layer shapes), so that a picture in the book stays true to the code it explains. Book side: only
notebooks import these, and they may use lib.bench.plots.
"""
