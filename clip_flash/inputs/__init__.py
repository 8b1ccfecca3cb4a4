"""Inputs: turning images and text into the tensors an OpenCLIP model takes, with OpenCLIP's exact values."""
