"""Chat with a trained actor: `python chat.py --path output/actor`. See inference/chatbot.py."""
from inference.chatbot import main

if __name__ == "__main__":
    main()
