// SVG files are imported as their text (JupyterLab's builder loads them as strings).
declare module '*.svg' {
  const value: string;
  export default value;
}
