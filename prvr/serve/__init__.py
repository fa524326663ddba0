"""What the app serves: its settings (``settings``), the model it chose (``model_choice``) and the
predictor that searches and takes uploads (``predictor``)."""
