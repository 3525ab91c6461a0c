"""The AppWrapper API as mcad sees it: resource quantities and vectors, demand inference, slim object views."""
