/* GET /docs: Swagger UI over this API's own OpenAPI schema (what FastAPI's default /docs page
   sets up, as a file, so that the page needs no inline script under its Content-Security-Policy). */
window.addEventListener("load", () => {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
