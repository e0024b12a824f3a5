"""The one exception type the converter reports to users: a message naming the file, tensor and reason."""


class ConversionError(Exception):
  """Bad input or a failed write. The message is complete on its own; the binary prints it and exits 1."""
