"""The dispatcher loop and the owners it drives: code that runs on the loop thread (or hands work to it), deciding
with the model and writing through the write pool; each module owns one part of what the loop decides."""
