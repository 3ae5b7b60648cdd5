// WebGPU's buffer-usage and map-mode flags, with the values the spec fixes. Used instead of the
// GPUBufferUsage / GPUMapMode globals so modules load before (or without) a WebGPU global — as
// in Node, where Dawn installs those globals only when it is first asked for a GPU.

export const BufferUsage = {
  MAP_READ: 0x0001,
  COPY_SRC: 0x0004,
  COPY_DST: 0x0008,
  UNIFORM: 0x0040,
  STORAGE: 0x0080,
} as const;

export const MapMode = { READ: 0x0001 } as const;
