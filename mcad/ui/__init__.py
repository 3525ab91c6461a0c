"""The dashboard's page: static HTML, CSS and one hand-written JavaScript module, shipped as package data and
served by ``mcad.serve.dashboard`` at /ui. No build step, and nothing is fetched from anywhere but the controller."""
