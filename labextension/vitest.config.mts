import { defineConfig } from 'vitest/config';

// The panel's model is plain TypeScript: node is enough, no DOM.
export default defineConfig({
  test: { environment: 'node', include: ['test/**/*.test.ts'] }
});
